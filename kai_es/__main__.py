from kai_es.cli import main

main()
