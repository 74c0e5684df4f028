// A button with data-copy="<element id>" copies that element's text to the clipboard and
// says so. navigator.clipboard needs a secure context (https or localhost); elsewhere the
// text is selected and copied the old way.
document.addEventListener("click", async (event) => {
  const button = event.target.closest("button[data-copy]");
  if (!button) return;
  const source = document.getElementById(button.dataset.copy);
  if (!source) return;
  const text = source.innerText;
  let done = false;
  try {
    await navigator.clipboard.writeText(text);
    done = true;
  } catch (err) {
    const range = document.createRange();
    range.selectNodeContents(source);
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    done = document.execCommand("copy");
  }
  const label = button.dataset.label || button.textContent;
  button.dataset.label = label;
  button.textContent = done ? "Copied" : "Select and copy by hand";
  setTimeout(() => { button.textContent = label; }, 2000);
});
