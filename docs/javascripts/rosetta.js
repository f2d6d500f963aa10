// Side-by-side columns wrap long code lines (docs/stylesheets/rosetta.css). For a wrapped line to
// read as Python, its continuation should hang below the line's own indentation, and the
// indentation itself must not be where the line breaks. So, once per code line in a .rosetta tab
// set: record the line's indentation in --hang (the CSS indents continuation lines by it), and
// wrap the leading spaces in a <span class="rosetta-indent"> that never wraps. The text is
// unchanged, so copying the code still copies it exactly.
(function () {
  function hang(line) {
    const walker = document.createTreeWalker(line, NodeFilter.SHOW_TEXT);
    let indent = 0;
    const spaces = [];
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const lead = node.data.length - node.data.replace(/^ +/, "").length;
      if (lead > 0) {
        spaces.push(lead < node.data.length ? node.splitText(lead) && node : node);
        indent += lead;
      }
      if (lead < node.data.length) break;
    }
    for (const node of spaces) {
      const wrap = document.createElement("span");
      wrap.className = "rosetta-indent";
      node.parentNode.insertBefore(wrap, node);
      wrap.appendChild(node);
    }
    line.style.setProperty("--hang", indent + 4 + "ch");
  }

  function run() {
    for (const line of document.querySelectorAll('.rosetta code > span[id^="__span"]')) {
      if (!line.dataset.hang) {
        line.dataset.hang = "1";
        hang(line);
      }
    }
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", run);
  else run();
})();
