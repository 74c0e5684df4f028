// The run page's charts, drawn with uPlot (static/vendor/uplot/) from the buckets that
// webapp/dashboard/charts.py puts beside each chart's SVG (a json_script): axes with round
// ticks in the values' own units (0, 5 ms, 10 ms), the values under the cursor in the
// legend, drag across to zoom in, double-click to zoom out. The SVG stays for pages read
// without JavaScript. The charts arrive by htmx after the page, hence htmx:afterSettle.
(function () {
  "use strict";

  var BINARY = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];

  function figures(value, digits) {
    // 0.05664975 -> "0.0566"; 76564 -> "76,564"; at most `digits` significant figures
    // below a thousand, whole numbers with separators above.
    if (value === null || value === undefined || !isFinite(value)) return "–";
    if (Number.isInteger(value) || Math.abs(value) >= Math.pow(10, digits - 1)) {
      return Math.round(value).toLocaleString("en-US");
    }
    if (value !== 0 && Math.abs(value) < 1e-4) return value.toExponential(digits - 1);
    return String(Number(value.toPrecision(digits)));
  }

  function bytes(value) {
    if (value === null || !isFinite(value)) return "–";
    var size = value, unit = 0;
    while (Math.abs(size) >= 1024 && unit < BINARY.length - 1) { size /= 1024; unit++; }
    return unit === 0 ? Math.round(size) + " B" : figures(size, 3) + " " + BINARY[unit];
  }

  function seconds(value) {
    // The scale of lifeboat/units.py format_seconds: µs, ms, s, then min / h / d.
    if (value === null || !isFinite(value)) return "–";
    var a = Math.abs(value), sign = value < 0 ? "-" : "";
    if (a === 0) return "0";
    if (a < 1e-3) return sign + figures(a * 1e6, 3) + " µs";
    if (a < 1) return sign + figures(a * 1e3, 3) + " ms";
    if (a < 60) return sign + figures(a, 3) + " s";
    if (a < 3600) return sign + figures(a / 60, 3) + " min";
    if (a < 172800) return sign + figures(a / 3600, 3) + " h";
    return sign + figures(a / 86400, 3) + " d";
  }

  var FORMATS = {
    bytes: bytes,
    seconds: seconds,
    number: function (v) { return figures(v, 4); },
    percent: function (v) { return v === null ? "–" : figures(v * 100, 3) + " %"; },
    step: function (v) { return v === null ? "–" : Math.round(v).toLocaleString("en-US"); },
  };

  // Tick labels: one unit for the whole axis (the largest tick's), with just enough
  // decimals to tell ticks `incr` apart: 298.83 KiB, 298.85 KiB; 4.5 ms, 5.0 ms; 0.
  var SECOND_UNITS = [[1e-3, 1e-6, "µs"], [1, 1e-3, "ms"], [60, 1, "s"], [3600, 60, "min"],
    [172800, 3600, "h"], [Infinity, 86400, "d"]];

  function fixed(value, decimals) {
    return value.toLocaleString("en-US", { minimumFractionDigits: decimals, maximumFractionDigits: decimals });
  }

  function decimalsFor(incr) {
    return incr > 0 ? Math.max(0, Math.min(6, Math.ceil(-Math.log10(incr) - 1e-9))) : 0;
  }

  function scaleOf(kind, largest) {
    if (kind === "bytes") {
      var k = 0;
      while (largest >= Math.pow(1024, k + 1) && k < BINARY.length - 1) k++;
      return [Math.pow(1024, k), " " + BINARY[k]];
    }
    if (kind === "seconds") {
      for (var i = 0; i < SECOND_UNITS.length; i++) {
        if (largest < SECOND_UNITS[i][0]) return [SECOND_UNITS[i][1], " " + SECOND_UNITS[i][2]];
      }
    }
    if (kind === "percent") return [0.01, " %"];
    return [1, ""];
  }

  function tickFormatter(kind) {
    return function (u, splits, axisIdx, space, incr) {
      var largest = Math.max.apply(null, splits.map(function (v) { return Math.abs(v || 0); }));
      var scale = scaleOf(kind, largest), decimals = decimalsFor((incr || 1) / scale[0]);
      if (kind === "step") decimals = 0;
      return splits.map(function (v) {
        if (v === null || v === undefined) return "";
        return v === 0 ? "0" : fixed(v / scale[0], decimals) + scale[1];
      });
    };
  }

  // Tick spacings uPlot may choose from: 1-2-5 decades, binary steps for sizes, whole
  // minutes and hours for durations, whole numbers for steps.
  function decades(from, to, mantissas) {
    var out = [];
    for (var e = from; e <= to; e++) {
      mantissas.forEach(function (m) { out.push(m * Math.pow(10, e)); });
    }
    return out;
  }
  var INCREMENTS = {
    step: decades(0, 12, [1, 2, 5]),
    bytes: [].concat.apply([], [0, 1, 2, 3, 4, 5].map(function (k) {
      return [1, 2, 5, 10, 20, 50, 100, 200, 500].map(function (m) { return m * Math.pow(1024, k); });
    })),
    seconds: decades(-6, 1, [1, 2, 5]).concat([30, 60, 120, 300, 600, 900, 1800, 3600,
      7200, 10800, 21600, 43200, 86400, 172800, 432000, 864000]),
  };

  function css(name, fallback) {
    var value = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
    return value || fallback;
  }

  function markersPlugin(markers, format) {
    // A dashed vertical line and its label at each marker (a resume, Daly's interval).
    return {
      hooks: {
        draw: function (u) {
          var ctx = u.ctx, top = u.bbox.top, height = u.bbox.height;
          ctx.save();
          ctx.strokeStyle = css("--bad", "#b42318");
          ctx.fillStyle = ctx.strokeStyle;
          ctx.setLineDash([4 * devicePixelRatio, 3 * devicePixelRatio]);
          ctx.lineWidth = devicePixelRatio;
          ctx.font = 11 * devicePixelRatio + "px system-ui, sans-serif";
          markers.forEach(function (marker, i) {
            var x = Math.round(u.valToPos(marker[0], "x", true));
            if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) return;
            ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + height); ctx.stroke();
            ctx.fillText(marker[1], x + 4 * devicePixelRatio, top + (12 + 13 * i) * devicePixelRatio);
          });
          ctx.restore();
        },
      },
    };
  }

  // A log axis of durations (the interval chart) ticks at durations people use, 45 px
  // apart at least, rather than at 10 s, 1.67 min, 16.7 min.
  var DURATIONS = [1e-3, 2e-3, 5e-3, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60,
    120, 300, 600, 900, 1800, 3600, 7200, 14400, 21600, 43200, 86400, 172800, 432000, 864000];

  function durationSplits(u, axisIdx, min, max) {
    var out = [], last = -Infinity;
    DURATIONS.forEach(function (t) {
      if (t < min || t > max) return;
      var at = u.valToPos(t, "x");
      if (at - last >= 45) { out.push(t); last = at; }
    });
    return out;
  }

  function labelWidth(u, values) {
    // Wide enough for the longest tick label (about 7 px a character at 12 px).
    var longest = (values || []).reduce(function (n, v) { return Math.max(n, String(v).length); }, 4);
    return longest * 7 + 26; // and the tick marks and gap beside them
  }

  function draw(figure) {
    var script = figure.querySelector('script[type="application/json"]');
    if (!script || figure.dataset.drawn || typeof uPlot === "undefined") return;
    var data = JSON.parse(script.textContent);
    if (!data.x || !data.x.length) return;
    figure.dataset.drawn = "1";
    var kind = data.kind || "number", xKind = data.x_kind || "step";
    var format = FORMATS[kind] || FORMATS.number, xFormat = FORMATS[xKind] || FORMATS.step;
    // x_kind "date": Unix seconds, drawn on uPlot's own time axis (dates in the reader's zone).
    var isDate = xKind === "date";
    if (isDate) xFormat = function (v) { return new Date(v * 1000).toLocaleString(); };
    var ink = css("--info", "#175cd3"), muted = css("--muted", "#5d6778"), line = css("--line", "#e4e7ec");
    var axisFont = "12px system-ui, sans-serif";
    var xName = xKind === "step" ? "step" : isDate ? "time" : "interval";
    var series = [{ label: xName, value: function (u, v) { return xFormat(v); } }];
    data.series.forEach(function (s, i) {
      series.push({
        label: s.label, stroke: ink, width: i === 0 ? 1.5 : 1,
        dash: i === 0 ? undefined : [3, 2],
        value: function (u, v) { return format(v); },
        points: { show: false },
      });
    });
    var holder = document.createElement("div");
    holder.className = "chart-plot";
    figure.appendChild(holder);
    var width = Math.max(figure.clientWidth - 20, 200);
    var options = {
      width: width, height: 170,
      series: series,
      bands: data.series.length === 2 ? [{ series: [1, 2], fill: ink + "22" }] : [],
      scales: { x: data.x_log
        ? { time: false, distr: 3, log: 10, range: function (u, min, max) { return [min, max]; } }
        : { time: isDate } },
      axes: [
        { stroke: muted, font: axisFont, size: 34, grid: { stroke: line, width: 1 }, ticks: { stroke: line },
          incrs: data.x_log || isDate ? undefined : INCREMENTS[xKind],
          splits: data.x_log ? durationSplits : undefined,
          // uPlot labels only powers of ten on a log axis unless told otherwise.
          filter: data.x_log ? function (u, splits) { return splits; } : undefined,
          values: data.x_log
            ? function (u, vals) { return vals.map(function (v) { return v == null ? "" : xFormat(v); }); }
            : isDate ? undefined : tickFormatter(xKind) },
        { stroke: muted, font: axisFont, size: labelWidth, grid: { stroke: line, width: 1 }, ticks: { stroke: line },
          incrs: INCREMENTS[kind],
          values: tickFormatter(kind) },
      ],
      cursor: { drag: { x: true, y: false }, points: { show: false } },
      legend: { live: true },
      plugins: [markersPlugin(data.markers || [], xFormat)],
    };
    var columns = [data.x].concat(data.series.map(function (s) { return s.values; }));
    var plot = new uPlot(options, columns, holder);
    figure.uplot = plot; // for the browser tests: the zoomed range
    figure.classList.add("chart-drawn");
    var hint = document.createElement("p");
    hint.className = "muted small chart-hint";
    hint.textContent = "Hover for values · drag across to zoom · double-click to zoom out";
    figure.appendChild(hint);
    if (window.ResizeObserver) {
      new ResizeObserver(function () {
        var w = Math.max(figure.clientWidth - 20, 200);
        if (Math.abs(w - plot.width) > 4) plot.setSize({ width: w, height: 170 });
      }).observe(figure);
    }
  }

  function drawAll(root) {
    (root || document).querySelectorAll("figure.chart").forEach(draw);
  }

  document.addEventListener("DOMContentLoaded", function () { drawAll(document); });
  document.addEventListener("htmx:afterSettle", function (event) { drawAll(event.target); });
  window.lifeboatCharts = { drawAll: drawAll, figures: figures, seconds: seconds, bytes: bytes };
})();
