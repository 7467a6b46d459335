"""Each inline script once per page.

sphinx-thebe (which Jupyter Book 1.x always loads) adds its configuration script, `const
THEBE_JS_URL = ...`, once per environment read, and a notebook page can end up with it twice:
the browser then stops at `Identifier 'THEBE_JS_URL' has already been declared`. The book uses
no Thebe, so a repeated inline script is simply dropped from the page.
"""


def _dedupe(app, pagename, templatename, context, doctree):
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, kept = set(), []
    for js in scripts:
        body = getattr(js, "attributes", {}).get("body") if hasattr(js, "attributes") else None
        key = ("body", body) if body else ("src", str(js))
        if key in seen:
            continue
        seen.add(key)
        kept.append(js)
    scripts[:] = kept


def setup(app):
    app.connect("html-page-context", _dedupe, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
