"""EAGLE-3 and target facts several stages share (layer ids, chains, text model)."""
