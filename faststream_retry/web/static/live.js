// Refreshes the overview's counts every 5 s from the JSON API. Counts are written as
// text (textContent), never as HTML; queue names are matched, not inserted.
(function () {
  "use strict";
  var script = document.currentScript;
  var url = script && script.getAttribute("data-status");
  if (!url) return;
  function show(cell, depth, field) {
    if (!cell) return;
    if (!depth || !depth.exists) { cell.textContent = field === "work" ? "missing" : "-"; return; }
    var value = field === "consumers" ? depth.consumers : depth.messages;
    cell.textContent = String(value);
    if (field === "dlq") cell.classList.toggle("some", value > 0);
  }
  function refresh() {
    fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (status) {
        if (!status) return;
        status.queues.forEach(function (q) {
          document.querySelectorAll("#queues tr[data-queue]").forEach(function (row) {
            if (row.getAttribute("data-queue") !== q.queue) return;
            show(row.querySelector('[data-field="work"]'), q.work, "work");
            show(row.querySelector('[data-field="consumers"]'), q.work, "consumers");
            show(row.querySelector('[data-field="retry"]'), q.retry, "retry");
            show(row.querySelector('[data-field="dlq"]'), q.dlq, "dlq");
          });
        });
        status.tiers.forEach(function (t) {
          var row = document.querySelector('#tiers tr[data-ttl="' + Number(t.ttl_ms) + '"]');
          if (row) show(row.querySelector('[data-field="tier"]'), t, "tier");
        });
      })
      .catch(function () { /* the next refresh tries again */ });
  }
  setInterval(refresh, 5000);
})();
