from modelopt.cli import main

main()
