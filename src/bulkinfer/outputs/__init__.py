"""The commands over finished outputs, above the run: ``compare`` (two outputs, column by
column kind), ``costs``, ``index`` (build a search index), ``status`` (``bulkinfer inspect``)
and the HTML report (``html``, its ``charts`` and picture ``thumbnails``)."""
