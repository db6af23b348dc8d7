"""The one exception type users see: a clear, actionable message, never a deep traceback."""


class SkillgraftError(Exception):
    """Bad input or an impossible request; the message names the file, field or setting at fault."""
