SELECT '{outcome}', {nulls}, held - credits
FROM state WHERE %(counted)s::boolean AND held IS NOT NULL
