"""neox-dar: Pythia-style pretraining with distance-adaptive and windowed attention."""

__version__ = "0.1.0"
