"""Layer 5, analysis: from merged CSVs to what people read — merge and table loading, derived
metrics (TFLOP/s, MFU, tokens/s), intervals and findings, figures, the report, the answers page
and run comparison. Never imports torch (a test checks it), so reports and comparisons of
committed runs build anywhere, fast.
"""
