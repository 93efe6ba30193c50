"""The bottom layer: user-facing errors, file formats and atomic writes, devices and dtypes.

Imports nothing else of mutor; everything above may import it.
"""
