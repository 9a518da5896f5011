"""python -m services.importer: run the importer service."""

from services.importer.app import main

main()
