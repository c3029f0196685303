// Live updates over server-sent events (EventSource reconnects with Last-Event-ID).
// Jobs page: a listed job's row is updated in place; new jobs are counted behind a
// control, so the rows never shift under the reader. Job page: the body is re-rendered
// on the job's events; the side panel shows the selected attempt and, while it runs,
// follows its transcript without moving a reader who scrolled up.
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

  if (!window.EventSource) return;
  const after = (job ? live : document.getElementById("new-jobs")).dataset.after;
  const source = new EventSource("/events?after=" + after + (job ? "&job=" + job : ""));
  let pending = false;
  const seen = new Set(Array.from(document.querySelectorAll("tr[data-job]"), (r) => r.dataset.job));
  source.addEventListener("merlin", (message) => {
    const event = JSON.parse(message.data);
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
      fetch("/api/jobs/" + event.job).then((r) => r.json()).then((view) => {
        const row = document.querySelector('tr[data-job="' + event.job + '"]');
        if (!row) return;
        const status = row.querySelector("td.status");
        status.textContent = view.status;
        status.className = "status " + view.status;
        row.querySelector("td.steps").textContent = view.progress.Completed + "/" + view.progress.total;
        row.querySelector("td.cost span").textContent = money(view);
        const tiers = view.steps.flatMap((s) => s.attempts).filter((a) => a.started_at);
        tiers.sort((a, b) => a.started_at.localeCompare(b.started_at));
        if (tiers.length) row.querySelector("td.tier").textContent = tiers[tiers.length - 1].tier;
      });
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
  });
})();
