"""From a request to a TaskList: classifying, planning, questions, specs, routing."""
