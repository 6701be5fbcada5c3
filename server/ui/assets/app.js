// Refreshes the parts of the page marked data-live every 2 s from the JSON
// at body[data-live-url]: the server renders them, this only swaps them in.
// Without JavaScript the page works as it is; a reload updates it.
(function () {
  "use strict";
  var url = document.body.getAttribute("data-live-url");
  if (!url || !window.fetch) { return; }
  function busy() {
    // Do not swap a part away under an operator typing a setup command.
    var a = document.activeElement;
    return a && (a.tagName === "INPUT" || a.tagName === "SUMMARY") && a.type !== "submit";
  }
  function tick() {
    fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (parts) {
        if (parts && !busy() && !logs.selecting()) {
          var kept = logs.save();
          document.querySelectorAll("[data-live]").forEach(function (el) {
            var html = parts[el.getAttribute("data-live")];
            if (typeof html === "string") { el.innerHTML = html; }
          });
          logs.restore(kept);
          document.body.setAttribute("data-refreshed", String(Date.now()));
        }
      })
      .catch(function () {})
      .then(function () { setTimeout(tick, 2000); });
  }
  setTimeout(tick, 2000);
})();

// logs keeps the reader's place in each output box (pre.log, by id) across
// a refresh, as tail -f does: a box scrolled to its end follows the newest
// lines; one the reader scrolled up stays where it was.
var logs = (function () {
  "use strict";
  var slack = 4; // px from the end that still count as at the end
  function boxes() { return document.querySelectorAll("pre.log[id]"); }
  function atEnd(el) { return el.scrollHeight - el.clientHeight - el.scrollTop <= slack; }
  function toEnd() { boxes().forEach(function (el) { el.scrollTop = el.scrollHeight; }); }
  document.addEventListener("DOMContentLoaded", toEnd);
  return {
    save: function () {
      var kept = {};
      boxes().forEach(function (el) { kept[el.id] = { end: atEnd(el), top: el.scrollTop }; });
      return kept;
    },
    restore: function (kept) {
      boxes().forEach(function (el) {
        var k = kept[el.id];
        el.scrollTop = (!k || k.end) ? el.scrollHeight : k.top;
      });
    },
    // selecting reports whether the reader is selecting text in a box: a
    // swap would take the selection away.
    selecting: function () {
      var s = window.getSelection && window.getSelection();
      if (!s || s.isCollapsed || !s.anchorNode) { return false; }
      var n = s.anchorNode.nodeType === 1 ? s.anchorNode : s.anchorNode.parentElement;
      return !!(n && n.closest && n.closest("pre.log"));
    }
  };
})();
