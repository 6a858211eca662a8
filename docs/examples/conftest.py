"""The docs' examples are tests: `make test` runs every file here."""
