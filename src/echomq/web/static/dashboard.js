// Live updates by polling the page's JSON twin (at most one request per poll period, and
// none while the tab is hidden). Values are written with textContent: never parsed as HTML.
(function () {
  "use strict";
  var body = document.body;
  var period = Math.max(1000, parseInt(body.getAttribute("data-poll-ms"), 10) || 2000);
  var live = document.querySelector("[data-live]");
  var status = document.getElementById("live");
  if (!live) { if (status) status.textContent = ""; return; }
  var url = live.getAttribute("data-live");
  var busy = false;

  function set(el, value) {
    // Counts as the server renders them: with thousands separators.
    var text = typeof value === "number" ? value.toLocaleString("en-US") : String(value);
    if (el.textContent !== text) el.textContent = text;
  }

  function applyOverview(data) {
    var rows = document.querySelectorAll("tr[data-queue]");
    var byName = {};
    data.queues.forEach(function (q) { byName[q.name] = q; });
    rows.forEach(function (row) {
      var q = byName[row.getAttribute("data-queue")];
      if (!q) return;
      row.querySelectorAll("[data-f]").forEach(function (cell) {
        var f = cell.getAttribute("data-f");
        if (f === "paused") set(cell, q.paused ? "paused" : "running");
        else if (f in q.counts) set(cell, q.counts[f]);
      });
    });
  }

  function applyQueue(data) {
    live.querySelectorAll("[data-f]").forEach(function (cell) {
      var f = cell.getAttribute("data-f");
      if (f in data.counts) set(cell, data.counts[f]);
    });
  }

  function tick() {
    if (busy || document.hidden) return;
    busy = true;
    fetch(url, { headers: { "Accept": "application/json" }, credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.json() : Promise.reject(r.status); })
      .then(function (data) {
        if (data.queues) applyOverview(data); else applyQueue(data);
        if (status) set(status, "live: updated " + new Date().toLocaleTimeString());
      })
      .catch(function () { if (status) set(status, "live: server not answering"); })
      .then(function () { busy = false; });
  }
  setInterval(tick, period);
})();
