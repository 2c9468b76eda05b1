"""VLM-GeoPrivacy: contextual-integrity location disclosure."""
