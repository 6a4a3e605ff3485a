"""attention_view with tokens that are HTML: ``<!--<script>`` used to blank the view and swallow the page after
it (only ``</`` was escaped). Every ``<``, ``>`` and ``&`` of the JSON payload is now spelled ``\\u003c`` etc.: no
token reaches the HTML raw, and the data reads back exactly."""

import json
import re

import torch

from interp.viz import attention_view

HOSTILE = ["<!--<script>", "</script>", "<script>alert(1)</script>", "a&b", "-->", "<!--", "x>y", "&lt;", "\u2028"]


def _view():
    T = len(HOSTILE)
    pattern = torch.softmax(torch.randn(2, T, T, generator=torch.Generator().manual_seed(0)), -1).tril()  # [H, T, T]
    return attention_view(pattern, tokens=HOSTILE, title="<!--<script> & co")


def test_no_token_reaches_the_html_raw():
    view = _view()
    for page in (view.to_html(), view.to_html(full_page=True)):
        assert "<!--" not in page and "-->" not in page
        assert page.count("<script") == 2  # the data element and the code: no third one from a token
        assert page.count("</script>") == 2
        data = re.search(r'<script type="application/json" id="[^"]+">(.*?)</script>', page, re.S).group(1)
        assert not set(data) & {"<", ">", "&"}


def test_the_payload_round_trips():
    view = _view()
    data = re.search(r'<script type="application/json" id="[^"]+">(.*?)</script>', view.to_html(), re.S).group(1)
    payload = json.loads(data)  # what the page's JSON.parse reads
    assert payload["tokens"] == HOSTILE and payload["title"] == "<!--<script> & co"
    assert payload["layers"][0]["heads"] == 2
