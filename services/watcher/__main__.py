"""python -m services.watcher: run the watcher service."""

from services.watcher.app import main

main()
