"""The Ditto engine: HuBERT → LMDM motion on the user's checkpoints, rendered by stitching,
warp, decoder and paste-back on the device."""
