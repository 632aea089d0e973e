"""Other tools' formats: convert from them (``sources/``), export to them, unpack to files.
"""
