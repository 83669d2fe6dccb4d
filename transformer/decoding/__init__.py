"""From a trained model to translations (§6.1): the searches, and the Translator that runs them on text."""
