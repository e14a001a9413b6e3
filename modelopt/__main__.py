from modelopt.cli.entry import main

main()
