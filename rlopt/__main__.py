from rlopt.cli import main

main()
