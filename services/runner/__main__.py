"""python -m services.runner: run a runner process."""

from services.runner.app import main

main()
