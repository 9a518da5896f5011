"""The bad-input corpus: files, their expected outcomes (cases.yaml) and a loader."""
