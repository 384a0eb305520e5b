"""Avatar-side image stages (putback of the rendered crop into the source frame)."""

from studio.avatar.putback import PasteBack, paste_mask

__all__ = ["PasteBack", "paste_mask"]
