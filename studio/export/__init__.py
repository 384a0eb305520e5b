"""Frames out: MP4 (H.264 + AAC) written whole or not at all, the encoder thread, RGB to YUV."""
