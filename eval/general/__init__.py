"""General capability: MMMU, OCRBench, MME and the SPY composite score."""
