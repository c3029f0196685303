// Live updates over server-sent events (EventSource reconnects with Last-Event-ID).
// Jobs page: a listed job's row is updated in place; new jobs are counted behind a
// control, so the rows never shift under the reader. Job page: the body is re-rendered
// on the job's events; the side panel shows the selected attempt and, while it runs,
// follows its transcript without moving a reader who scrolled up. Without EventSource,
// or while the stream is down, the same events are polled for every 3 s (/api/events).
(function () {
  "use strict";
  for (const form of document.querySelectorAll("form[data-confirm]")) {
    form.addEventListener("submit", (e) => { if (!confirm(form.dataset.confirm)) e.preventDefault(); });
  }
  const live = document.querySelector("[data-live]");
  if (!live) return;
  const job = live.dataset.job;
  const panel = document.getElementById("panel");
  let selected = null;

  function money(view) {
    const known = "$" + view.known_cost_usd.toFixed(4);
    return view.unpriced_calls ? "≥" + known + " (+" + view.unpriced_calls + " unpriced)" : known;
  }

  function mark() {
    for (const bar of live.querySelectorAll("a.bar")) {
      bar.classList.toggle("selected", bar.dataset.panel === selected);
    }
  }

  function showPanel(href, keepScroll) {
    return fetch(href + "?panel=1").then((r) => r.text()).then((html) => {
      // Where the reader is now, not when the request left: they may have scrolled since.
      const atBottom = panel.scrollTop + panel.clientHeight >= panel.scrollHeight - 24;
      const top = panel.scrollTop;
      panel.innerHTML = html;
      panel.hidden = false;
      panel.dataset.href = href;
      if (keepScroll) panel.scrollTop = atBottom ? panel.scrollHeight : top;
    });
  }

  if (panel) {
    live.addEventListener("click", (e) => {
      const bar = e.target.closest("a.bar");
      if (!bar || e.ctrlKey || e.metaKey || e.shiftKey) return;
      e.preventDefault();
      selected = bar.dataset.panel;
      mark();
      showPanel(bar.getAttribute("href"), false).then(() => { panel.scrollTop = 0; });
    });
    // A running attempt's transcript grows without events: read it again while it runs.
    setInterval(() => {
      if (!panel.hidden && panel.querySelector("[data-running]")) showPanel(panel.dataset.href, true);
    }, 1500);
  }

  // Each event is handled once, whether the stream or the polling brought it.
  let last = Number((job ? live : document.getElementById("new-jobs")).dataset.after);
  let pending = false;
  const refreshing = new Set();
  const seen = new Set(Array.from(document.querySelectorAll("tr[data-job]"), (r) => r.dataset.job));

  function refreshRow(id) {
    if (refreshing.has(id)) return;
    refreshing.add(id);
    setTimeout(() => {
      refreshing.delete(id);  // an event from now on asks again
      fetch("/api/jobs/" + id).then((r) => r.json()).then((view) => update(id, view));
    }, 300);
  }

  function update(id, view) {
    const row = document.querySelector('tr[data-job="' + id + '"]');
    if (!row) return;
    const status = row.querySelector("td.status");
    status.textContent = view.status;
    status.className = "status " + view.status;
    row.querySelector("td.steps").textContent = view.progress.Completed + "/" + view.progress.total;
    row.querySelector("td.cost span").textContent = money(view);
    const tiers = view.steps.flatMap((s) => s.attempts).filter((a) => a.started_at);
    tiers.sort((a, b) => a.started_at.localeCompare(b.started_at));
    if (tiers.length) row.querySelector("td.tier").textContent = tiers[tiers.length - 1].tier;
  }

  function handle(event) {
    if (event.id <= last) return;
    last = event.id;
    if (job) {
      if (pending) return;
      pending = true;
      setTimeout(() => {
        pending = false;
        fetch("/jobs/" + job + "/body").then((r) => r.text()).then((html) => {
          live.innerHTML = html;
          mark();
          if (panel && !panel.hidden && event.step === (selected || "").split("#")[0]) {
            showPanel(panel.dataset.href, true);
          }
        });
      }, 300);
    } else if (seen.has(event.job)) {
      refreshRow(event.job);
    } else {
      seen.add(event.job);
      const wanted = new URLSearchParams(location.search);
      const count = () => {
        const note = document.getElementById("new-jobs");
        note.hidden = false;
        const number = note.querySelector("span");
        number.textContent = String(Number(number.textContent) + 1);
        note.onclick = () => { location.href = note.dataset.first; };
      };
      if (!wanted.get("status") && !wanted.get("repo")) { count(); return; }
      // A filtered page counts only the new jobs its filter would list.
      fetch("/api/jobs/" + event.job).then((r) => r.json()).then((view) => {
        if ((wanted.get("status") || view.status) === view.status &&
            (wanted.get("repo") || view.repo) === view.repo) count();
      });
    }
  }

  // The fallback: without EventSource, or while the stream is down, the same events are
  // asked for every POLL ms (/api/events); the stream takes over again once it is open.
  const POLL = 3000, RETRY = 5000;
  let fallback = false, asking = false;
  const query = () => "?after=" + last + (job ? "&job=" + encodeURIComponent(job) : "");
  function poll() {
    if (!fallback || asking) return;
    asking = true;
    fetch("/api/events" + query()).then((r) => (r.ok ? r.json() : [])).catch(() => []).then((batch) => {
      asking = false;
      batch.forEach(handle);
      if (batch.length >= 500) poll();  // a full batch: more are waiting
    });
  }
  setInterval(poll, POLL);
  function polling(on) {
    document.body.dataset.live = on ? "polling" : "stream";
    document.getElementById("live-mode").hidden = !on;
    const was = fallback;
    fallback = on;
    if (on && !was) poll();
  }
  function connect() {
    const source = new EventSource("/events" + query());
    source.addEventListener("merlin", (message) => handle(JSON.parse(message.data)));
    source.onopen = () => polling(false);
    source.onerror = () => {
      polling(true);
      // CLOSED: the browser gave up (an HTTP error, not a cut): open a new one later.
      if (source.readyState === EventSource.CLOSED) setTimeout(connect, RETRY);
    };
  }
  if (window.EventSource) connect(); else polling(true);
})();
