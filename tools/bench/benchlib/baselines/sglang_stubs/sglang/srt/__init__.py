"""verify_attn bench stand-in for the `sglang.srt` package (see ../../README.md)."""
