"""Unit tests, in folders that mirror src/specbuild."""
