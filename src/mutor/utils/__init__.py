"""The bottom layer: user-facing errors, file formats and atomic writes, devices, and whether to ask the Hub.

Imports nothing else of mutor; everything above may import it.
"""
