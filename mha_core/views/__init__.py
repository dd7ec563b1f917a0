"""The views drawn in the browser, outside the app too: their files (``assets``: the scripts and styles, and the one
list of the files each view needs), their colours (``palette``), how their arrays travel (``packing``), what each view
is sent (``heads``, ``long``), and the self-contained file and the notebook widget (``standalone``). Nothing here
imports Streamlit or Plotly; the app's components (``ui.viewkit``, ``ui.headview``, ``ui.longview``) use these same
files and packers."""
