"""Templates the LSP tests share: a long one for the latency figures."""

from __future__ import annotations


def long_template(lines: int = 1000) -> str:
    """A template of `lines` lines: front matter, then blocks of text, inserted inputs, holes
    with each kind of constraint, a loop and a condition (each block 10 lines)."""
    head = "---\ninputs: [topic, items]\ntemperature: 0\n---\n"
    blocks = []
    for i in range((lines - 4) // 10):
        blocks.append(
            f"Section {i} about {{{{ topic }}}}.\n"
            f"Count: {{{{ gen count_{i} regex=INT max_tokens=4 }}}}\n"
            f"Date: {{{{ gen date_{i} regex=DATE }}}}\n"
            f'Mood: {{{{ select mood_{i} options=["good", "bad"] }}}}\n'
            f"{{% for item in items %}}\n"
            f"- {{{{ item | upper }}}}: {{{{ gen note_{i} stop=\"\\n\" }}}}\n"
            f"{{% endfor %}}\n"
            f"{{% if count_{i} == '3' %}}three{{% else %}}other{{% endif %}}\n"
            f'Data: {{{{ gen data_{i} json={{"type": "object", "properties": '
            f'{{"a": {{"type": "integer"}}}}}} }}}}\n'
            f"{{# comment {i} #}}\n")
    return head + "".join(blocks)
