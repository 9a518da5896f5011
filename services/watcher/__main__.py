from services.watcher.app import main

main()
