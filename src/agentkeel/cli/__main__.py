from agentkeel.cli.main import main

main()
