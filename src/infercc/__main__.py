from infercc.cli import main

main()
