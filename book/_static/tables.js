// Every table of a page gets what labsupport.glue.table gives its own: each cell names its column
// (data-label), a cell of text the class text, and the table the class book-table, so that
// book.css shows it with tight cells on a wide screen (a text cell may break a long word, numbers
// never); and a table wider than its box on a phone is marked `stacked`, which book.css shows as
// one card per row. A table that glue.table did not make (a
// Styler or a DataFrame a cell displayed, a table written in the prose) and whose rows do not
// match its one row of headers is left as it is: it scrolls in its own box.
const WORD = /[A-Za-z_]{4}/; // a cell with a word in it holds text; "5.80 (5.79–5.81)" or "28.1 ms" does not
document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll(".bd-article table").forEach(function (table) {
    const heads = table.querySelectorAll("thead tr");
    const names = heads.length === 1 ? Array.from(heads[0].children).map((th) => th.textContent.trim()) : null;
    const rows = Array.from(table.querySelectorAll("tbody tr"));
    const labelled = table.classList.contains("book-table");
    if (!labelled && (!names || !rows.length || rows.some((tr) => tr.children.length !== names.length))) return;
    rows.forEach(function (tr) {
      Array.from(tr.children).forEach(function (cell, i) {
        if (!cell.hasAttribute("data-label") && names) cell.setAttribute("data-label", names[i]);
        if (WORD.test(cell.textContent)) cell.classList.add("text");
      });
    });
    table.classList.add("book-table");
  });
  const tables = Array.from(document.querySelectorAll(".bd-article table.book-table"));
  function stackWhatOverflows() {
    tables.forEach((t) => t.classList.remove("stacked"));
    const wide = tables.filter((t) => t.scrollWidth > t.clientWidth + 1 || t.getBoundingClientRect().width > t.parentElement.clientWidth + 1);
    wide.forEach((t) => t.classList.add("stacked"));
  }
  stackWhatOverflows();
  window.addEventListener("resize", stackWhatOverflows);
});
