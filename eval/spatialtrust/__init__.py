"""SpatialTrust and the SpatialTrustGuard staged pipeline."""
