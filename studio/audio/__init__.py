"""Audio in: loading and validating speech (16 kHz mono), phonetics, HuBERT features."""
