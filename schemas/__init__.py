"""trialbus's contract: pydantic models only, no I/O."""
