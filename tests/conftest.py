"""Shared test setup: Qt runs offscreen (without a display Qt aborts)."""

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
