// The trace page's script (qrun/trace/html.py inlines it; its CSP admits this script alone).
// One set of delegated listeners on the text, none per token, so a 10k-token run stays light.
// Everything shown comes from the token's data attributes and is set with textContent.
"use strict";
(function () {
  const text = document.getElementById("text");
  const tip = document.getElementById("tip");
  if (!text || !tip) return;
  const tokens = text.getElementsByClassName("t"); // in event order: tokens[i] has data-i = i
  let current = text.querySelector(".t[tabindex]"); // the one tab stop (a roving tabindex)
  let shown = null;
  let hovered = null;

  function el(tag, content, cls) {
    const node = document.createElement(tag);
    if (content !== undefined) node.textContent = content;
    if (cls) node.className = cls;
    return node;
  }

  // A string as a JSON literal, with the characters JSON leaves raw but a reader cannot see
  // (or that reorder the line: bidi controls) escaped too; the same set as html.py's _HIDDEN.
  const hidden = /[\u007f-\u009f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]/g;
  function quoted(s) {
    return JSON.stringify(s).replace(hidden, function (c) {
      return "\\u" + c.charCodeAt(0).toString(16).padStart(4, "0");
    });
  }

  function pct(p) {
    return p >= 0.001 ? (p * 100).toFixed(1) + "%" : p.toExponential(1);
  }

  function tokenText(t) {
    return t.dataset.raw !== undefined ? JSON.parse(t.dataset.raw) : t.textContent;
  }

  function holeLabel(index) {
    const row = document.getElementById("h-" + index);
    return row ? row.dataset.name + " (#" + index + ")" : "#" + index;
  }

  function optionLabel(hole, k) {
    const row = document.querySelectorAll("#h-" + hole + " .options tr")[k];
    if (!row) return "#" + k;
    return quoted(row.dataset.text) + ", " + pct(Number(row.dataset.p)) + " of the options";
  }

  function describe(t) {
    const d = t.dataset;
    const dl = el("dl");
    const row = function (key, value) { dl.append(el("dt", key), el("dd", value)); };
    let kind = d.k;
    if (t.classList.contains("c")) kind += ", KV from cache";
    if (d.drop !== undefined) kind += ", rolled back (" + d.drop + ")";
    row("kind", kind);
    row("id", d.id);
    row("position", d.pos);
    if (d.hole !== undefined) row("hole", holeLabel(d.hole));
    if (d.opt !== undefined) row("option", optionLabel(d.hole, Number(d.opt)));
    if (d.lp !== undefined) {
      row("logprob", Number(d.lp).toFixed(4));
      row("prob", pct(Number(d.p)));
    }
    if (d.mask !== undefined) row("mask", d.mask + " tokens allowed");
    const parts = [el("div", quoted(tokenText(t)), "tip-text"), dl];
    if (d.top !== undefined) parts.push(alternatives(JSON.parse(d.top), d.id));
    return parts;
  }

  function alternatives(top, selfId) {
    const table = el("table");
    const head = el("tr");
    head.append(el("th", "top alternatives"), el("th", "prob", "num"), el("th", "logprob", "num"));
    table.append(head);
    for (const [id, s, lp] of top) {
      const tr = el("tr", undefined, String(id) === selfId ? "self" : "");
      tr.title = "id " + id;
      tr.append(el("td", quoted(s)), el("td", pct(Math.exp(lp)), "num"),
                el("td", lp.toFixed(3), "num"));
      table.append(tr);
    }
    return table;
  }

  function place(t) {
    const r = t.getClientRects()[0] || t.getBoundingClientRect();
    const view = document.documentElement.clientWidth;
    const left = Math.max(8, Math.min(r.left, view - tip.offsetWidth - 8));
    let top = r.bottom + 6;
    if (top + tip.offsetHeight > window.innerHeight && r.top - tip.offsetHeight - 6 > 0) {
      top = r.top - tip.offsetHeight - 6;
    }
    tip.style.left = left + window.scrollX + "px";
    tip.style.top = top + window.scrollY + "px";
  }

  function show(t) {
    if (shown) shown.removeAttribute("aria-describedby");
    tip.replaceChildren(...describe(t));
    tip.hidden = false;
    place(t);
    t.setAttribute("aria-describedby", "tip");
    shown = t;
  }

  function hide() {
    if (shown) shown.removeAttribute("aria-describedby");
    tip.hidden = true;
    shown = null;
  }

  function focusToken(t) {
    if (!t) return;
    if (current && current !== t) current.tabIndex = -1;
    t.tabIndex = 0;
    current = t;
    t.focus({ preventScroll: true });
    t.scrollIntoView({ block: "nearest" });
  }

  function scored(from, step) {
    for (let i = from + step; i >= 0 && i < tokens.length; i += step) {
      if (tokens[i].dataset.lp !== undefined) return tokens[i];
    }
    return null;
  }

  function token(target) {
    return target instanceof Element ? target.closest(".t") : null;
  }

  text.addEventListener("mouseover", function (e) {
    const t = token(e.target);
    hovered = t;
    if (t && t !== shown) show(t);
  });
  text.addEventListener("mouseleave", function () {
    hovered = null;
    const active = token(document.activeElement);
    if (active && text.contains(active)) show(active); else hide();
  });
  text.addEventListener("click", function (e) {
    focusToken(token(e.target));
  });
  text.addEventListener("focusin", function (e) {
    const t = token(e.target);
    if (!t) return;
    if (current && current !== t) current.tabIndex = -1;
    t.tabIndex = 0;
    current = t;
    show(t);
  });
  text.addEventListener("focusout", function (e) {
    if (!text.contains(e.relatedTarget)) {
      if (hovered) show(hovered); else hide();
    }
  });
  text.addEventListener("keydown", function (e) {
    const t = token(e.target);
    if (!t) return;
    const i = Number(t.dataset.i);
    let next;
    switch (e.key) {
      case "ArrowRight": next = tokens[i + 1]; break;
      case "ArrowLeft": next = tokens[i - 1]; break;
      case "ArrowDown": next = scored(i, 1); break;
      case "ArrowUp": next = scored(i, -1); break;
      case "Home": next = tokens[0]; break;
      case "End": next = tokens[tokens.length - 1]; break;
      case "Escape": hide(); e.preventDefault(); return;
      default: return;
    }
    e.preventDefault();
    focusToken(next);
  });
  window.addEventListener("resize", function () { if (shown) place(shown); });
})();
