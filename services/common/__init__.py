"""Modules shared by the services: settings, logging, the event bus, the ledger port."""
