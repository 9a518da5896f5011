from services.runner.app import main

main()
