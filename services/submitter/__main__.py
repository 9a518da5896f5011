from services.submitter.app import main

main()
