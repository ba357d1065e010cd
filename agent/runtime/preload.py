"""Imported once by the forkserver that forks the workers: pays for torch's
import and its first meta-device modules (about two seconds) before any
worker exists, so every worker starts warm."""

from .model import FAMILIES, DecoderConfig
from .parts import warm_up

for family in FAMILIES:
    warm_up(DecoderConfig(layers=1, hidden=8, ffn_hidden=8, heads=1, seq_len=2, vocab=2, family=family))
