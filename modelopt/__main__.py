from modelopt.cli.app import main

main()
