/* safestop console: bulk stop on the runs page (DESIGN §12).
 *
 * Works without this script: the checkboxes post with the form, "Stop all N matching" posts the
 * current filters, and the preview is a page of its own. With it:
 * - ticked rows survive the live refreshes of the table (the region is swapped whole on every
 *   run change) and moving between pages: the selection is kept here and re-applied;
 * - the header checkbox ticks every row of the page, and then offers "Select all N matching";
 * - the preview opens as a modal dialog (Escape closes it, focus goes into it and back).
 */
(function () {
  "use strict";
  // Strings go through Django's JavaScript catalog (the page loads /jsi18n/ first); without it
  // (a test page that loads only this file) they stay English.
  var gettext = window.gettext || function (text) { return text; };
  var interpolate = window.interpolate || function (format, values) {
    return format.replace(/%\((\w+)\)s/g, function (_m, name) { return String(values[name]); });
  };

  var selected = {}; // run id -> true
  var matching = false; // "Select all N matching" chosen
  var opener = null;

  function form() { return document.getElementById("bulk-form"); }
  function rows() { return document.querySelectorAll("input[data-bulk-row]"); }
  function count() { return Object.keys(selected).length; }

  function render() {
    var f = form();
    if (!f) return;
    var boxes = rows();
    var all = boxes.length > 0;
    for (var i = 0; i < boxes.length; i++) {
      boxes[i].checked = matching || !!selected[boxes[i].value];
      if (!boxes[i].checked) all = false;
    }
    var page = f.ownerDocument.querySelector("input[data-bulk-page]");
    if (page) { page.hidden = boxes.length === 0; page.checked = all; }
    var total = f.dataset.bulkMatchingCount || "0";
    // what the page says: "1000+" once the count reached its cap (console/selectors.py)
    var label = f.dataset.bulkMatchingLabel || total;
    var summary = f.querySelector("[data-bulk-summary]");
    var selectMatching = f.querySelector("[data-bulk-select-matching]");
    var stopSelected = f.querySelector("[data-bulk-selected]");
    if (matching) {
      summary.textContent = interpolate(gettext("All %(n)s matching runs selected."), { n: label }, true);
      selectMatching.textContent = gettext("Clear selection");
      selectMatching.hidden = false;
    } else {
      summary.textContent = count() ? interpolate(gettext("%(n)s selected."), { n: count() }, true) : "";
      selectMatching.textContent = interpolate(gettext("Select all %(n)s matching"), { n: label }, true);
      selectMatching.hidden = !(all && Number(total) > boxes.length);
    }
    stopSelected.value = matching ? "matching" : "selected";
    stopSelected.disabled = !matching && count() === 0;
  }

  document.addEventListener("change", function (evt) {
    var el = evt.target;
    if (el.matches && el.matches("input[data-bulk-row]")) {
      if (el.checked) selected[el.value] = true; else delete selected[el.value];
      if (!el.checked) matching = false;
      render();
    } else if (el.matches && el.matches("input[data-bulk-page]")) {
      var boxes = rows();
      for (var i = 0; i < boxes.length; i++) {
        if (el.checked) selected[boxes[i].value] = true; else delete selected[boxes[i].value];
      }
      if (!el.checked) matching = false;
      render();
    }
  });

  document.addEventListener("click", function (evt) {
    var el = evt.target.closest && evt.target.closest("[data-bulk-select-matching]");
    if (el) {
      matching = !matching;
      if (!matching) selected = {};
      render();
      return;
    }
    var close = evt.target.closest && evt.target.closest("[data-bulk-close]");
    if (close) {
      var dialog = close.closest("dialog");
      if (dialog && dialog.open) dialog.close();
    }
  });

  // Rows ticked on other pages (or before a live refresh) go with the form as hidden fields;
  // a change of filters starts a new selection.
  document.addEventListener("submit", function (evt) {
    var f = evt.target;
    if (f.id === "runs-filters") { selected = {}; matching = false; return; }
    if (f.id !== "bulk-form") return;
    var carried = f.querySelectorAll("input[data-bulk-carried]");
    for (var i = 0; i < carried.length; i++) carried[i].remove();
    var shown = {};
    var boxes = rows();
    for (var j = 0; j < boxes.length; j++) shown[boxes[j].value] = true;
    Object.keys(selected).forEach(function (id) {
      if (shown[id]) return;
      var input = document.createElement("input");
      input.type = "hidden"; input.name = "ids"; input.value = id;
      input.setAttribute("data-bulk-carried", "");
      f.appendChild(input);
    });
    opener = document.activeElement;
  }, true);

  document.addEventListener("htmx:afterSettle", function (evt) {
    var target = evt.detail && evt.detail.elt;
    if (!target) return;
    if (target.id === "runs-region" || (target.querySelector && target.querySelector("#bulk-form"))) render();
    if (target.id === "bulk-dialog-slot") {
      var dialog = target.querySelector("dialog[data-bulk-dialog]");
      if (dialog && !dialog.open && dialog.showModal) dialog.showModal();
    }
  });

  // Back to the button that opened the preview when it closes (Escape or Cancel).
  document.addEventListener("close", function (evt) {
    if (evt.target.matches && evt.target.matches("dialog[data-bulk-dialog]") && opener && opener.focus) {
      opener.focus();
    }
  }, true);

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", render);
  else render();
})();
