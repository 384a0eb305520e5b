"""The studio's desktop GUI (PySide6 + pyqtgraph). Only this package imports Qt."""
