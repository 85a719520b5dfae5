"""gpupool: pool every GPU of an organisation and hand it out dynamically."""

__version__ = "0.1.0"
