/* safestop console: "Approve with edits" on an approval page.
 *
 * The editor (`textarea[data-arguments-editor]`) must hold a JSON object. While it does not, or
 * while it says nothing new, the confirm button stays disabled and a line says why; once it
 * does, a line diff against the original arguments (`#approval-original-arguments`, written
 * by the server with json_script) is shown, and only then may the reviewer confirm. Both
 * sides are laid out alike (sorted keys, two-space indent) so the diff shows changes, not
 * formatting. The server checks again, against the agent's JSON Schema too, and answers a
 * failure on the form. Without JavaScript the button is simply enabled.
 */
(function () {
  "use strict";
  // Strings go through Django's JavaScript catalog (the page loads /jsi18n/ first); without it
  // (a test page that loads only this file) they stay English.
  var gettext = window.gettext || function (text) { return text; };
  var ngettext = window.ngettext || function (one, many, n) { return n === 1 ? one : many; };
  var interpolate = window.interpolate || function (format, values) {
    return format.replace(/%\((\w+)\)s/g, function (_m, name) { return String(values[name]); });
  };

  var MAX_CELLS = 4000000; // the LCS table's size limit: a bigger diff is summarised, not drawn

  function canonical(value) {
    if (Array.isArray(value)) return value.map(canonical);
    if (value !== null && typeof value === "object") {
      var out = {};
      Object.keys(value).sort().forEach(function (key) { out[key] = canonical(value[key]); });
      return out;
    }
    return value;
  }

  function pretty(value) {
    return JSON.stringify(canonical(value), null, 2);
  }

  // A line diff: the longest common subsequence of the lines between a shared head and tail.
  // Returns [[op, line], ...] with op "+", "-" or " ".
  function diffLines(a, b) {
    var head = 0;
    while (head < a.length && head < b.length && a[head] === b[head]) head++;
    var tail = 0;
    while (tail < a.length - head && tail < b.length - head &&
           a[a.length - 1 - tail] === b[b.length - 1 - tail]) tail++;
    var x = a.slice(head, a.length - tail), y = b.slice(head, b.length - tail);
    var out = [], i, j;
    for (i = 0; i < head; i++) out.push([" ", a[i]]);
    if ((x.length + 1) * (y.length + 1) > MAX_CELLS) {
      x.forEach(function (line) { out.push(["-", line]); });
      y.forEach(function (line) { out.push(["+", line]); });
    } else {
      var n = x.length, m = y.length, width = m + 1;
      var lcs = new Uint32Array((n + 1) * width);
      for (i = n - 1; i >= 0; i--) {
        for (j = m - 1; j >= 0; j--) {
          lcs[i * width + j] = x[i] === y[j] ? lcs[(i + 1) * width + j + 1] + 1
            : Math.max(lcs[(i + 1) * width + j], lcs[i * width + j + 1]);
        }
      }
      i = 0; j = 0;
      while (i < n && j < m) {
        if (x[i] === y[j]) { out.push([" ", x[i]]); i++; j++; }
        else if (lcs[(i + 1) * width + j] >= lcs[i * width + j + 1]) { out.push(["-", x[i]]); i++; }
        else { out.push(["+", y[j]]); j++; }
      }
      for (; i < n; i++) out.push(["-", x[i]]);
      for (; j < m; j++) out.push(["+", y[j]]);
    }
    for (i = a.length - tail; i < a.length; i++) out.push([" ", a[i]]);
    return out;
  }

  function original() {
    var holder = document.getElementById("approval-original-arguments");
    try { return holder ? JSON.parse(holder.textContent) : {}; } catch (e) { return {}; }
  }

  function drawDiff(pre, lines) {
    pre.textContent = "";
    lines.forEach(function (pair) {
      var span = document.createElement("span");
      span.className = "diff__line diff__line--" + (pair[0] === "+" ? "add" : pair[0] === "-" ? "del" : "same");
      span.textContent = pair[0] + " " + pair[1] + "\n";
      pre.appendChild(span);
    });
  }

  function check(editor) {
    var form = editor.form;
    if (!form) return;
    var say = form.querySelector("[data-arguments-check]");
    var pre = form.querySelector("[data-arguments-diff]");
    var confirm = form.querySelector("[data-arguments-confirm]");
    var verdict = function (ok, text) {
      if (confirm) confirm.disabled = !ok;
      if (say) {
        say.textContent = text;
        say.classList.toggle("is-bad", !ok && text.indexOf("Not") === 0);
      }
      editor.setAttribute("aria-invalid", ok || text.indexOf("Not") !== 0 ? "false" : "true");
    };
    var value;
    try {
      value = JSON.parse(editor.value);
    } catch (error) {
      if (pre) pre.hidden = true;
      verdict(false, interpolate(gettext("Not valid JSON: %(error)s"), { error: error.message }, true));
      return;
    }
    if (value === null || typeof value !== "object" || Array.isArray(value)) {
      if (pre) pre.hidden = true;
      verdict(false, gettext("Not a JSON object: the arguments must be {…}."));
      return;
    }
    var before = pretty(original()).split("\n");
    var after = pretty(value).split("\n");
    var lines = diffLines(before, after);
    var changed = lines.filter(function (pair) { return pair[0] !== " "; }).length;
    if (!changed) {
      if (pre) pre.hidden = true;
      verdict(false, gettext("No change from the original yet (to run it as asked, use Approve)."));
      return;
    }
    if (pre) { drawDiff(pre, lines); pre.hidden = false; }
    verdict(true, interpolate(ngettext("%(n)s line differs from the original: check it, then confirm.", "%(n)s lines differ from the original: check them, then confirm.", changed), { n: changed }, true));
  }

  function init(root) {
    var editors = (root && root.querySelectorAll ? root : document).querySelectorAll("[data-arguments-editor]");
    for (var i = 0; i < editors.length; i++) check(editors[i]);
  }

  document.addEventListener("input", function (evt) {
    if (evt.target && evt.target.matches && evt.target.matches("[data-arguments-editor]")) check(evt.target);
  });
  // The decision region is swapped by htmx (a refused edit comes back with the form): check again.
  document.addEventListener("htmx:load", function (evt) { init(evt.target); });
  document.addEventListener("DOMContentLoaded", function () { init(document); });
  init(document);
})();
