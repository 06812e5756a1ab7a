"""Infrastructure the stages use and that imports none of them: files, logs, locks."""
