"""scalerl-mega: ScaleRL (Khatri et al., 2025) on Megatron-Core + SGLang, with compute-scaling fits.

Importing the package is cheap and side-effect free: no torch, megatron or sglang import happens here.
"""

__version__ = "0.1.0"
