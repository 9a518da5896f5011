from services.importer.app import main

main()
