"""What the tritonclient scripts beside this file share: named checks that each report what went
wrong, so that one failing check does not hide the others."""
import traceback


def run_check(checks, name, body):
    """Runs `body()`; checks[name] is "ok", or the exception and where it was raised."""
    try:
        body()
        checks[name] = "ok"
    except Exception as e:  # each check reports what went wrong; the others still run
        checks[name] = f"{type(e).__name__}: {e} | " + traceback.format_exc(limit=3).replace("\n", " ")
